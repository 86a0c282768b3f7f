"""fcd_secure.federation"""
