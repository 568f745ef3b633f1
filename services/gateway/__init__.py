"""The search gateway: plans a query, fans it out to every retrieval leg and fuses the lists."""
