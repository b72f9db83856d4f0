"""Searching the template space: the pricer, beam searches, rule-based templates and priced refinement."""
