"""The store: engine and migrations, the schema (tables, rollups, bins, lengths); sub-rooms writes/ and reads/."""
