"""The Blackwell (sm_100a) series: tcgen05, tensor memory, CLC, 2-CTA MMA."""
