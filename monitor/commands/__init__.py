"""The shell's command line: ``draftwatch`` and each sub-command group, one module a group.

No library package imports a command; commands import the wings they drive.
"""
