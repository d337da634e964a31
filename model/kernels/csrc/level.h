/* The library holds the kernels once per x86-64 level (setup.py compiles every source for the baseline, for
 * x86-64-v3 and for x86-64-v4, with BEAMSERVE_LEVEL 1, 3 and 4): each build's exported functions carry its
 * level in their names (beamserve_attend_v4), so the builds link into one library side by side, and each
 * build's kernels call their own level's. dispatch.c says which level this CPU runs; model/kernels/native.py
 * binds that level's functions by their plain names. Included first by every kernel source. */
#ifndef BEAMSERVE_LEVEL_H
#define BEAMSERVE_LEVEL_H
#ifndef BEAMSERVE_LEVEL
#error "setup.py compiles the kernels once per x86-64 level, with BEAMSERVE_LEVEL set"
#endif
#define BEAMSERVE_PASTE(name, level) name##_v##level
#define BEAMSERVE_AT(name, level) BEAMSERVE_PASTE(name, level)
#define BEAMSERVE_LEVELED(name) BEAMSERVE_AT(name, BEAMSERVE_LEVEL)

#define beamserve_attend BEAMSERVE_LEVELED(beamserve_attend)
#define beamserve_avx_vnni BEAMSERVE_LEVELED(beamserve_avx_vnni)
#define beamserve_avx_vnni_allow BEAMSERVE_LEVELED(beamserve_avx_vnni_allow)
#define beamserve_avx2_int8_gemm BEAMSERVE_LEVELED(beamserve_avx2_int8_gemm)
#define beamserve_avx2_linear BEAMSERVE_LEVELED(beamserve_avx2_linear)
#define beamserve_beam_advance BEAMSERVE_LEVELED(beamserve_beam_advance)
#define beamserve_beam_step BEAMSERVE_LEVELED(beamserve_beam_step)
#define beamserve_beam_steps BEAMSERVE_LEVELED(beamserve_beam_steps)
#define beamserve_copy_rows BEAMSERVE_LEVELED(beamserve_copy_rows)
#define beamserve_cpu_level BEAMSERVE_LEVELED(beamserve_cpu_level)
#define beamserve_cross_sublayer BEAMSERVE_LEVELED(beamserve_cross_sublayer)
#define beamserve_decoder_layers BEAMSERVE_LEVELED(beamserve_decoder_layers)
#define beamserve_decoder_segment BEAMSERVE_LEVELED(beamserve_decoder_segment)
#define beamserve_embed BEAMSERVE_LEVELED(beamserve_embed)
#define beamserve_encoder_layers BEAMSERVE_LEVELED(beamserve_encoder_layers)
#define beamserve_encoder_segment BEAMSERVE_LEVELED(beamserve_encoder_segment)
#define beamserve_f32_block BEAMSERVE_LEVELED(beamserve_f32_block)
#define beamserve_f32_gemm BEAMSERVE_LEVELED(beamserve_f32_gemm)
#define beamserve_f32_swish BEAMSERVE_LEVELED(beamserve_f32_swish)
#define beamserve_f32_linear BEAMSERVE_LEVELED(beamserve_f32_linear)
#define beamserve_f32_pack BEAMSERVE_LEVELED(beamserve_f32_pack)
#define beamserve_f32_packed_floats BEAMSERVE_LEVELED(beamserve_f32_packed_floats)
#define beamserve_follow BEAMSERVE_LEVELED(beamserve_follow)
#define beamserve_int8_gemm BEAMSERVE_LEVELED(beamserve_int8_gemm)
#define beamserve_layer_norm BEAMSERVE_LEVELED(beamserve_layer_norm)
#define beamserve_linear_forward BEAMSERVE_LEVELED(beamserve_linear_forward)
#define beamserve_log_softmax BEAMSERVE_LEVELED(beamserve_log_softmax)
#define beamserve_quantize_rows BEAMSERVE_LEVELED(beamserve_quantize_rows)
#define beamserve_rescale_log_softmax BEAMSERVE_LEVELED(beamserve_rescale_log_softmax)
#define beamserve_scale_back BEAMSERVE_LEVELED(beamserve_scale_back)
#define beamserve_scale_back_log_softmax BEAMSERVE_LEVELED(beamserve_scale_back_log_softmax)
#define beamserve_self_attend_step BEAMSERVE_LEVELED(beamserve_self_attend_step)
#define beamserve_self_sublayer BEAMSERVE_LEVELED(beamserve_self_sublayer)
#define beamserve_silu BEAMSERVE_LEVELED(beamserve_silu)
#define beamserve_top_candidates BEAMSERVE_LEVELED(beamserve_top_candidates)
#define beamserve_vectorised BEAMSERVE_LEVELED(beamserve_vectorised)
#define beamserve_vnni BEAMSERVE_LEVELED(beamserve_vnni)
#define beamserve_vnni_amx BEAMSERVE_LEVELED(beamserve_vnni_amx)
#define beamserve_amx_allow BEAMSERVE_LEVELED(beamserve_amx_allow)
#define beamserve_vnni_int8_gemm BEAMSERVE_LEVELED(beamserve_vnni_int8_gemm)
#define beamserve_vnni_linear BEAMSERVE_LEVELED(beamserve_vnni_linear)
#define beamserve_vnni_pack BEAMSERVE_LEVELED(beamserve_vnni_pack)
#define beamserve_vnni_packed_bytes BEAMSERVE_LEVELED(beamserve_vnni_packed_bytes)
#endif
