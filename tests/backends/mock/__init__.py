"""Unit and end-to-end tests of the ``mock`` backend."""
