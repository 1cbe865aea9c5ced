"""HTTP clients of Chatwoot and System One, and the HTTP client they share."""
