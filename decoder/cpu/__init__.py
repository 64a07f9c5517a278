"""The CPU back end: int8/int4 weights and their C++ kernels, row-stable passes, fused norms, attention.

The speculation core (decoder/ above this package) runs on any device; what makes it fast on a
CPU lives here. docs/quantization.md explains the formats and the kernels.
"""
