"""Extractor service: the map step of answering, atomic facts from the reranked passages."""
