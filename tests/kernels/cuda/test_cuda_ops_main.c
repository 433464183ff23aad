/* SPDX-License-Identifier: Apache-2.0 */
/* Entry point of test_cuda_ops.cu (nvcc-compiled; the executable links as C). */
int kn_cuda_test_ops_main(void);

int main(void)
{
	return kn_cuda_test_ops_main();
}
