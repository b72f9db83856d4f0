"""Completion by rule: a template (a plan's structure) becomes full plans: layer split, batch sharing,
placement, pricing and polishing."""
