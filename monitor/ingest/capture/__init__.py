"""The opt-in prompt sample (``capture.*``): real prompts per workload, kept for ``draftwatch evaluate``.

Prompts are otherwise never stored: a record carries only a hash of its prompt. With
``capture.share`` above 0 the sidecar keeps, per workload, a uniform sample of the prompts it sees
(proxied OpenAI-compatible requests, the embedded decoder's ``/v1/generate`` and
``/v1/chat/completions``), so that a candidate pairing can be tried on the traffic it would serve.

Sampling is two steps. A Bernoulli(``share``) gate on the request's own thread decides whether the
request is considered at all; then, in a writer thread, Algorithm R keeps it in its workload's
reservoir of ``max_per_workload`` slots: the n-th request considered fills slot n - 1 while there
is room, and afterwards replaces a uniformly chosen slot with probability cap / n. The count n is
kept per workload in the file, so that after a restart (and across processes sharing the file) the
kept prompts stay a uniform sample of all that were considered. Both random draws are seeded once
per process.

Where: a SQLite file of its own (``capture.path``, ``prompt-sample.db`` in the data directory),
never the records' database. So a backup, replica or export of the records never carries a
prompt, the sample has its own owner-only file mode and lifetime, deleting the file deletes every
prompt, and it works the same whether the records live in SQLite or PostgreSQL. The file is made
on the first kept prompt: with the default share of 0 it never exists. Deletion overwrites what it
deletes (SQLite's ``secure_delete``).

Retention: a prompt older than ``retention_days`` is deleted on every write, every minute while
the sidecar runs, and by each ``draftwatch capture`` command before it reads. The pruning belongs
to the process that holds the file, not to the scheduler's retention job: the scheduler's lease
elects one leader among replicas, and each replica keeps its own file in its own data directory.
What is left after pruning is still uniform over the newer prompts considered, each kept with the
same probability, only fewer; a purge restarts a workload's count.

The sub-room: ``sample.py``, the file (its reservoir, retention, purge and the commands' reads);
``sidecar.py``, the gate and the writer thread of a serving process; ``rows.py``, a request's row.

Capture never fails or slows a request: the gate is one random draw, a prompt goes onto a bounded
queue (full: dropped and counted), and what goes wrong is counted and logged by the error's kind
only, never with a prompt (:mod:`monitor.log_safe`).
"""
