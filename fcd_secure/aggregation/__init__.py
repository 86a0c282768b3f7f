"""fcd_secure.aggregation: how the server combines the sites' Θc (paper Table II, "Aggregation").

- :mod:`.fedavg`  sample-size-weighted FedAvg of the synchronised parameters (the plain path, with the update screen)
- :mod:`.secagg`  pairwise-masked secure aggregation (Bonawitz et al., CCS 2017), pure Python, no Flower import
"""
