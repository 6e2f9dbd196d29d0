"""cni-reaper: repair the CNI results cache a crashed node left behind."""

__version__ = "0.1.0"
