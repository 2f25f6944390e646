"""Peer-to-peer networking over libp2p: identities, gossip and transfer protocols.

Invariant: a node's libp2p identity is the key in its data directory; the peer ID derived from it is the
one registered on chain.
"""
