"""The scheduler: APScheduler 3.x jobs (drift run + alerts, webhook delivery, health, retention)
run by exactly one replica, elected through a lease row with a fencing epoch.

Entry points: :class:`monitor.scheduler.service.SchedulerService` (``draftwatch scheduler`` and
inside ``draftwatch serve``) and :class:`monitor.scheduler.lease.Lease`.
"""
