"""JSON Schemas (draft 2020-12) for every record kind, shipped with the package."""
