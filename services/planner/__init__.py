"""The planner service: turns a question into a retrieval plan (strategy, pool size, dense
query variations, hard keywords, HyDE)."""
