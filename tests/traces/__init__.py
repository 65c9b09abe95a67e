"""Tests for the traces package."""
