"""Advanced batching strategies: a small, legible serving-engine core for the book's chapter 7."""
