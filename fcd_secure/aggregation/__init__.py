"""fcd_secure.aggregation"""
