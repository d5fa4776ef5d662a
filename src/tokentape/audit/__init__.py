"""Audit tools: replay a step, locate a document, verify stores."""
