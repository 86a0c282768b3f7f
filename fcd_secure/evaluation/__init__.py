"""fcd_secure.evaluation"""
