"""The Hopper (sm_90a) series: wgmma, TMA, clusters with TMA multicast."""
