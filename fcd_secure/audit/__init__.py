"""fcd_secure.audit"""
