/* SPDX-License-Identifier: Apache-2.0 */
/* `ctrlctl doctor` (ctrlctl_doctor.c). @return the exit code: 0 nothing failed, 1 something did. */
#ifndef CTRLCTL_DOCTOR_H
#define CTRLCTL_DOCTOR_H

int ctrlctl_doctor(int argc, char **argv, int as_json);

#endif
