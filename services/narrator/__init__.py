"""The narrator service: the reduce step of answering (cited synthesis, verification, fallbacks)."""
