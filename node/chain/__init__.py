"""The chain layer: contract artifacts, a web3 client with nonce management, Anvil and deployment.

Invariant: every on-chain call in rollnet goes through `rollnet.node.chain.client.ChainClient`.
"""
