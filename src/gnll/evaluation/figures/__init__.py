"""The paper's figures beyond the main tables (Fig. 2 ablation, Fig. 3 next tokens), used by ``scripts/``."""
