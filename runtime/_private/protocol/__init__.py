"""Frames, authentication and message types of the lumos wire protocol.

Knows bytes and message classes; never tasks or objects.
"""
