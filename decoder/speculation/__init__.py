"""The speculative loop and what steers it: one request as a chain of draft-and-verify steps.

``speculative.py`` runs a request (prefill, steps, the stream, the hand-over of its record), with
``target_pass.py`` (the timed unit of every step), ``stopping.py`` (end-of-sequence and stop
strings) and ``accounting.py`` (counts and timings, the record at the end). ``controller.py``
decides per workload how far to speculate and whether at all, from what ``calibration.py`` timed
of the pair's passes and what each request measured. The acceptance rule itself and the one
logits-to-probabilities transform stay at the decoder's top (``decoder/verify.py``,
``decoder/sampling.py``), beside the record's contract (``decoder/record.py``).
"""
