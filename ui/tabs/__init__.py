"""One module per tab of the page."""
