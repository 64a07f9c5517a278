"""Scrape mode: the engines' own Prometheus counters, read per interval, where no per-request record exists.

Many deployments expose only aggregate counters (vLLM's ``vllm:spec_decode_*``, llama.cpp's
``llamacpp:spec_decode_*`` with ``--metrics``, SGLang's ``sglang:spec_accept_rate`` gauge). The
scheduler's leader scrapes each ``[[scrape]]`` target (:mod:`monitor.ingest.scrape.run`), turns
the counters into one row per target, series and interval (:mod:`monitor.ingest.scrape.deltas`,
with reset detection), and records the target's health; the reads, the drift test and the health
rule treat the interval as the unit of evidence.
"""
