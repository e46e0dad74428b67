"""Exporters read published snapshots; they never sample."""
