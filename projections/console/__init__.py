"""The console's pure model: overview, conversation timeline, page layout."""
