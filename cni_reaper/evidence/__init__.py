"""Boot evidence: the witnesses that say when the previous boots began and how they ended."""
