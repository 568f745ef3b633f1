"""The answer wing of the gateway: an Ask's steps after its search (the evidence gate, the
extractive answer or the LLM's, narration, the support check). It builds on the search side
(services.gateway); the search side never imports it, and only the servicer wires both."""
