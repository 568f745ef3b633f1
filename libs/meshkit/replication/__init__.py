"""Stores kept identical across replicas: the replicated log and store (README.md)."""
