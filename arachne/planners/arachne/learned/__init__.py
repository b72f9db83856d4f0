"""The learned parts of the arachne planner: numeric features, the policy and the screening ranker (numpy inference)."""
