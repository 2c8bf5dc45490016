"""Model weights: the cache, downloads, and the download step of a load."""
