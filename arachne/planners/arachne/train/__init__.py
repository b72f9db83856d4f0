"""Offline training of the arachne policy: problem generation, the priced teacher, imitation and
cost-model-reward ranking in torch, policy-visited states re-labelled by the teacher (DAgger)."""
