"""Speculative decoding: drafts from a sequence's own tokens and their verification."""
