"""creditlab: reproduce token-level credit assignment papers in RLVR, end to end."""

__version__ = "0.1.0"
