"""Boot evidence: the witnesses of which boot wrote what, and how each boot ended."""
