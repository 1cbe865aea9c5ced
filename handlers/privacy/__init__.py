"""Crypto-shredding (issue 32): personal fields sealed under a data key per conversation, data keys wrapped by the
operator's key-encryption key (docs/privacy.md)."""
