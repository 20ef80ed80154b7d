"""Metadata drivers, chosen by a metadata service URI (see open_metadata_store)."""
