"""Checking copies: reconciliation (counts, checksums), the snapshot diff, reports."""
