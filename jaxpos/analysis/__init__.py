"""Model-independent analyses of positional encodings (the papers' diagnostics). Import the modules directly;
this package imports nothing, so it stays cheap.

taps                 attention weights, hidden states, value-output maps, embedding-to-hidden-state functions
decomposition        additive decomposition e = i + h + f + c of encoder outputs (Mickus et al.)
profile              positional profile F-hat_P of an absolute-position model (TISA eq. 9-12)
probing              identical-word probing of positional attention (Chen et al. A.1)
identifiability      token identifiability probes (Brunner et al. section 4)
plots                figures
toeplitz             Toeplitz fit and Toeplitzness R^2, position Gram matrix (TISA App. B)
locality             locality and symmetry metrics, attenuated encoding sweep (Chen et al. eq. 6-8, Fig. 3)
rank                 numerical rank of logit and positional matrices (DIET Fig. 2, 8)
effective_attention  null-space projection of attention, raw vs effective correlation (Brunner et al. section 3)
attribution          hidden token attribution from Jacobian norms (Brunner et al. section 5)
tisa_fit             TISA kernels fitted to positional profiles (TISA App. C)
"""
