"""The generation layer, between the served models and the HTTP routes."""
