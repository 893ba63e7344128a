"""Streams: what a connection holds, the book of live streams, rings, text, time-outs."""
