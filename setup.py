"""What pyproject.toml cannot say: the checkout's ``migrations/`` ships inside the package.

The Alembic scripts stay at the repository's top level (where ``alembic revision`` writes them) and
install as ``monitor.store.migrations``, where :func:`monitor.store.migrate.migrations_dir` finds them
in a wheel. pyproject.toml's ``packages.find`` has no way to add a package from another folder, so
the package list is made here.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["decoder*", "monitor*", "dashboard*"]),
        "monitor.store.migrations",
        "monitor.store.migrations.versions",
    ],
    package_dir={"monitor.store.migrations": "migrations", "monitor.store.migrations.versions": "migrations/versions"},
)
