"""fcd_secure.data"""
