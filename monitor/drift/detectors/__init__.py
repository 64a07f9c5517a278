"""The drift detectors, one test per module: what each compares, its statistic, its effect and its floor.

The window-against-window tests (``acceptance``, ``acceptance_by_length``, ``latency``,
``prompt_length``, ``traffic_mix``, on the base ``windowed``), speculation's net loss
(``net_loss``), scraped series (``scraped``) and the online Page–Hinkley detector between runs
(``page_hinkley``, its state kept by ``online``). A detector takes samples and returns
:class:`~monitor.drift.result.DriftResult`; which windows, which samples and what is stored is the
run's (``monitor.drift.run``, the one module at the room's top that imports this sub-room).
"""
