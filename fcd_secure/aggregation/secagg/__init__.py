"""Pairwise-masked secure aggregation (Bonawitz et al., CCS 2017). Pure Python over bytes and numpy: no Flower import."""
