"""The arachne planner (``planner.py``): templates, rule completion, priced candidates and a learned policy."""
