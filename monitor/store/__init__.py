"""The store: engine and migrations, tables, the writer, rollups, and every read over requests and rollups."""
