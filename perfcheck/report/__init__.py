"""Report: presentation only. Terminal text, CSV/JSON tables, HTML pages and plots of the reconciled tables."""
