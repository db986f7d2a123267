"""Controller side of aicluster.stethoscope: store, spool, metric catalog and CLI."""

__version__ = "1.0.0"
